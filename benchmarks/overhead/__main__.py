"""``python -m benchmarks.overhead``: re-executes with the caching allocator, asks for 8 simulated
CPU devices, then runs the benchmark (see the package docstring)."""

from benchmarks import harness

harness.reexec_with_caching_malloc()
harness.force_host_devices(8)

from benchmarks.overhead import main  # noqa: E402  (jax is imported after the set-up above)

main.main()
