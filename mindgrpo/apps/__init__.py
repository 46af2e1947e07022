"""Applications built on the library: the environment doctor, the memory planner, GSM8K evaluation, metric
plots and the embedded demo."""
