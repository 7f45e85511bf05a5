"""Record and dataset IO: shards, curricula, sources, corpora and evaluation files."""
