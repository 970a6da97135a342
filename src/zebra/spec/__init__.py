"""What a model is, computed without torch: layer patterns, parameter counts, decode-cache sizes and FLOPs (`arch`)."""
