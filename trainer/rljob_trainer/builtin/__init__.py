"""Built-in pieces that need no download: a character tokenizer, a tiny model, tasks, rewards."""
