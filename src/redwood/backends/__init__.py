"""Model runtimes behind the `Backend` protocol (base.py): transformers (hf.py)."""
