"""Model execution: GGUF range reading, llama-family stage roles, tokenizer and sampling."""
