"""Support code for the tests and the benchmarks (tiny random models, the browser driver): not shipped in the package."""
