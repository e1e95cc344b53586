"""Where CI's time goes: the test suite of a baseline commit against today's, test by test.

CI runs ``make test``; most of its time is the non-Ray pytest pass. This benchmark runs that
pass (``-m "not slow and not ray"``, two xdist workers, as the Makefile does) on a checkout of
``--baseline`` and on the working tree, one after the other, with the plugin
:mod:`benchmarks.ci_time.pytest_times` recording each test's wall and CPU seconds. Tests are
matched by name (the test files were moved and renamed since; a name found in several files is
matched within the file of the same base name), so the report separates

* the tests both suites have: the same assertions, now and then (what a refactoring of the
  tests or of the code they run made faster or slower);
* the tests only today's suite has, grouped by the work that added them (``ORIGINS``);
* the baseline's tests with no match today (merged or renamed beyond recognition).

CPU seconds (every thread and reaped child process of the test) are the comparison: the two
suites run minutes apart on a shared machine, and CPU time moves far less with the load than
wall time does. The wall times are reported beside them.

The measurement is one cell, ``results/per_test.json.xz`` (a folder that holds it is not
measured again); ``--set from_dirs=BASELINE,CURRENT`` analyses per-test records already
measured (the plugin's output folders) instead of running the suites.

  python -m benchmarks.ci_time --out /tmp/ci --set baseline=34a7beb   # both suites (~40 min)
  python -m benchmarks.ci_time --report_only           # tables and plot from results/
"""
