"""The lab: studies, benchmarks and their results."""
