"""Where one `sangam profile` grid point's time goes: `Engine.step()` on the given shapes through the
profiler's own worker parts (`calib.profile_runner.Profiler`), timed as the profile times them, then under
torch.profiler (kernel time by category and the top kernels, `executor_speed.profile`). GPU only:

    python -m benchmarks.step_probe --model llada-8b --quantization fp8 --kv-cache-dtype fp8 \
        --shapes 'p:1024:1024' 'p:512:512;p:512:512'

`--cprofile N` prints the host's top functions over N back-to-back steps of each shape instead. Written
for issue 30's question why LLaDA-8B FP8's single prefills of 256-1,536 tokens take 33-38 ms in the
profile while two prefills of 512 take 20 ms.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
from collections.abc import Callable

import torch

from benchmarks.executor_speed import profile
from calib.profile_runner import FILLER, Profiler
from profiles.shapes import Shape
from sangam.hardware import kv_pages, lookup_gpu, lookup_model


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="step_probe", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="llada-8b")
    parser.add_argument("--quantization", choices=("fp8",), default=None)
    parser.add_argument("--kv-cache-dtype", choices=("auto", "fp8"), default="auto")
    parser.add_argument("--shapes", nargs="+", type=Shape.parse, required=True, metavar="ITEMS")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--cprofile",
        type=int,
        default=0,
        metavar="N",
        help="instead of torch.profiler: the host's top functions over N steps (cProfile)",
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("step_probe: needs a CUDA GPU")
    pages = kv_pages(lookup_model(args.model), lookup_gpu("h200"), kv_dtype=args.kv_cache_dtype)
    profiler = Profiler(
        args.model, "random", pages, True, torch.device("cuda"), args.quantization, args.kv_cache_dtype
    )
    for shape in args.shapes:
        seconds = profiler.time(shape, warmup=1, repeats=args.repeats)
        print(f"{shape.format()}: {seconds * 1e3:.2f} ms (median of {args.repeats}, each after the filler)")

        def after_filler(shape: Shape = shape) -> None:
            for other in FILLER:
                profiler._step(other)
            profiler._step(shape)

        def alone(shape: Shape = shape) -> None:
            profiler._step(shape)

        if args.cprofile:
            host_profile(alone, args.cprofile)
        else:
            profile(f"{shape.format()} with the filler before it", after_filler)
            profile(f"{shape.format()} alone, back to back", alone)


def host_profile(step: Callable[[], None], steps: int) -> None:
    """The host's functions by own time and by cumulative time over `steps` calls of `step`."""
    profiler = cProfile.Profile()
    step()
    profiler.enable()
    for _ in range(steps):
        step()
    profiler.disable()
    for order in ("tottime", "cumulative"):
        pstats.Stats(profiler).sort_stats(order).print_stats(25)


if __name__ == "__main__":
    main()
