"""Decoding: the generation loop (engine), drafters, verification rules, sampling, stats."""
