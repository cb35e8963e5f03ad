"""`sangam app` runs this: the explorer and the sim-vs-live page.

Everything sits under the `__main__` guard: the simulator's worker processes are spawned, and a spawned
process re-imports the main script (as `__mp_main__`); they must not import Streamlit or draw the app.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main() -> None:
    try:
        import app  # noqa: F401
    except (
        ModuleNotFoundError
    ):  # `streamlit run app/streamlit_app.py` in a checkout puts only app/ on the path
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

    import streamlit as st

    from app import explore, live_compare, search_page

    st.set_page_config(page_title="Sangam what-if explorer", layout="wide")
    pages = [
        st.Page(explore.main, title="What-if explorer", url_path="explore", default=True),
        st.Page(search_page.main, title="Capacity under an SLO", url_path="search"),
        st.Page(live_compare.main, title="Simulated vs live", url_path="live"),
    ]
    st.navigation(pages).run()


if __name__ == "__main__":
    main()
