"""What a run keeps: the safetensors state file of the outer state and the per-interval records
(docs/algorithm.md#engineering, #paper-figures); the run folders, written, read back and plotted."""
