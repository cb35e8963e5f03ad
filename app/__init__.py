"""The Streamlit what-if explorer: a thin layer over `sangam` and `sim` (no scheduling logic here).

`streamlit_app.py` is the entry (`sangam app` starts it); `explore.py` and `live_compare.py` are its pages.
`sweep.py`, `series.py`, `inputs.py` and `analysis.py` import no Streamlit, so they are testable alone.
"""
