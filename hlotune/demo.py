"""`make demo`: compile a bundled model with hlotune and check it against the reference."""
