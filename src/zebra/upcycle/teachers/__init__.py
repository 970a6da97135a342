"""Teachers: a dense Transformer read tensor by tensor under Hugging Face names (`teacher`), one reader per file
format (`from_hf`, `from_gguf`, `from_megatron`), and the teacher rebuilt as a Hugging Face causal LM (`causal_lm`)."""
