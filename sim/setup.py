"""A simulation resolved on its testbed once, into one typed object that the drivers hand down.

A testbed supplies what a run cannot observe (docs/design.md section 7): its GPU and KV pages, arrival
clip, forwards per block, KV link and handoff, control delay, the profile that prices iterations and
what its worker loop adds to them. Flags given
explicitly override its values. `Resolver` does this once per testbed (each model's profile is read
once) and `resolve` once per run; nothing downstream looks a name up again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from profiles.store import Profile
from profiles.testbed import Testbed
from profiles.testbeds import (
    looped_cost_model,
    scaled_cost_model,
    testbed_config,
    testbed_progress,
    testbed_scales,
    unscaled_cost_model,
)
from runs.config import RunConfig
from sangam.cost import CostModel, TimeScales
from sim.options import SimOptions, options_on_testbed


@dataclass(frozen=True, slots=True)
class Setup:
    """One run on its testbed: the config (the testbed's GPU, pages and arrival clip), the simulator's
    options (link, control delay), the forwards-per-block spec and the cost model with its name."""

    testbed: Testbed
    config: RunConfig
    options: SimOptions
    progress: str
    cost: CostModel
    cost_name: str
    profile: Profile | None


class Resolver:
    """Resolves runs on one testbed; `given`: the SimOptions flags given explicitly (None: absent)."""

    def __init__(self, testbed: Testbed, given: Mapping[str, Any] | None = None) -> None:
        self.testbed = testbed
        self.options = options_on_testbed(testbed, given or {})
        self._unscaled: dict[str, tuple[CostModel, str, Profile | None]] = {}

    def resolve(
        self,
        base: RunConfig,
        given: Mapping[str, Any] | None = None,
        progress: str | None = None,
        scales: TimeScales | None = None,
    ) -> Setup:
        """`base` on the testbed, except where `given` (pages, arrival_clip, arrival_cv given explicitly)
        or `progress` (`--progress`) say; iterations priced by the model's profile times `scales`
        (default: the testbed's for the model) times `--time-scale`, plus the testbed's loop costs."""
        cost, name, profile = self.priced(base.model, scales)
        config = testbed_config(self.testbed, base, profile, given or {})
        spec = testbed_progress(self.testbed, base.model, base.trace, progress)
        return Setup(self.testbed, config, self.options, spec, cost, name, profile)

    def priced(self, model: str, scales: TimeScales | None = None) -> tuple[CostModel, str, Profile | None]:
        """What prices `model`'s iterations, its name for summary.json, and the profile: the testbed's
        profile of the model (read once) times `scales` (default: the testbed's for the model) times
        `--time-scale`; with `--cost analytic`, the analytic model of the testbed's GPU, unscaled but for
        `scales` and `--time-scale`; then the testbed's loop costs (unscaled: they are not the profile's).
        ValueError (one line) where the testbed has no profile of the model."""
        if model not in self._unscaled:
            self._unscaled[model] = unscaled_cost_model(self.testbed, model, self.options.cost)
        unscaled, name, profile = self._unscaled[model]
        if scales is None:
            scales = testbed_scales(self.testbed, model, profile)
        cost, name = scaled_cost_model(unscaled, name, scales.times(self.options.time_scale))
        cost, name = looped_cost_model(self.testbed, cost, name)
        return cost, name, profile
