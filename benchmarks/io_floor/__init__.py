"""benchmarks/io_floor_bench.py's modules: machine (the machine's state, ckpt's memory budget), cases
(the sources and the timed commands), ratios (the ratios and bounds, peak memory), render (the
tables and the docs/BENCHMARKS.md entry). They import io_modes_bench and hf_bench from benchmarks/,
which io_floor_bench.py puts on sys.path first."""
