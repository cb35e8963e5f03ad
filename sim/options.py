"""The simulator's own options: the testbed inputs a run cannot observe (KV link and handoff, control delay,
costs)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from profiles.testbed import Testbed
from runs.args import non_negative_float, positive_float
from runs.config import CONTROL_MS
from runs.options import option
from sangam.faults import Failure, parse_failures
from sim.cluster import LinkSpec
from sim.links import load_link

LINK_FIELDS = ("link", "link_gbps", "link_latency_ms")


@dataclass(frozen=True, slots=True)
class SimOptions:
    """How `sangam sim` prices iterations, KV transfers and dispatches."""

    testbed: str | None = option(
        None, "the testbed modelled: a name in profiles/data/testbeds or a JSON file (GPU, profiles, "
        "forwards per block, KV link, control delay, arrivals); flags given explicitly override its values",
        default_text="sangam-<gpu>, so sangam-h100",
    )  # fmt: skip
    link_gbps: float = option(
        100.0, "KV link bandwidth, GB/s (an assumed NVLink figure)", parse=positive_float
    )
    link_latency_ms: float = option(1.0, "KV link latency, ms", parse=non_negative_float)
    link: str | None = option(
        None, "a measured KV link profile instead: a name in profiles/data/links or a JSON file",
        default_text="the assumed link of --link-gbps and --link-latency-ms",
    )  # fmt: skip
    control_ms: float = option(
        CONTROL_MS, "control-plane delay on every dispatch, ms (as measured live on an H200)",
        parse=non_negative_float,
    )  # fmt: skip
    handoff_ms: float = option(
        0.0, "control-plane handoff added to every KV transfer (from a prefill's end to its KV send), ms",
        parse=non_negative_float,
    )  # fmt: skip
    cost: str = option(
        "profile", "iteration times: the measured (or derived) profile of --model on --gpu, or analytic",
        choices=("profile", "analytic"),
    )  # fmt: skip

    time_scale: float = option(
        1.0, "multiply every iteration's time by this: a what-if of a slower (or faster) executor",
        parse=positive_float,
    )  # fmt: skip

    fail: str | None = option(
        None, "workers lost during the run: W@T[,W@T...], worker ids and seconds (e.g. 1@30,2@45.5)",
        metavar="W@T",
    )  # fmt: skip
    restart_after: float | None = option(
        None, "lost workers restart as with sangam live --restart-workers (after 1 s, then twice the last "
        "wait while they die within 60 s of their start, at most 30 s; given up after 5 such restarts in a "
        "row), each back, empty, S seconds after its restart starts (a process's start-up)",
        parse=non_negative_float, metavar="S", default_text="never",
    )  # fmt: skip

    def failures(self) -> list[Failure]:
        return parse_failures(self.fail) if self.fail else []

    def link_spec(self) -> LinkSpec:
        link = load_link(self.link) if self.link else LinkSpec(self.link_gbps, self.link_latency_ms / 1000)
        return dataclasses.replace(link, handoff_s=self.handoff_ms / 1000) if self.handoff_ms else link

    def kv_link(self) -> dict[str, Any]:
        """What summary.json records of the link."""
        link = self.link_spec()
        return {
            "source": self.link or "assumed", "gb_per_s": link.gb_per_s, "latency_s": link.latency_s,
            "handoff_s": link.handoff_s,
        }  # fmt: skip


def options_on_testbed(testbed: Testbed, given: Mapping[str, Any]) -> SimOptions:
    """The simulator's options on the testbed: its link, handoff and control delay unless `given` (the
    SimOptions flags given explicitly; None: absent) names a link, handoff or delay of its own."""
    values = {name: value for name, value in given.items() if value is not None}
    if not any(name in values for name in LINK_FIELDS):
        link = testbed.link
        if link.profile is not None:
            values["link"] = link.profile
        else:
            values.update(link_gbps=link.gb_per_s, link_latency_ms=link.latency_ms)
    values.setdefault("control_ms", testbed.control_ms.value)
    values.setdefault("handoff_ms", testbed.handoff_s * 1000)
    values["testbed"] = testbed.name
    return SimOptions(**values)
