"""Accuracy and latency of a decision endpoint on JevBench-format tasks, with baselines from the same run."""
