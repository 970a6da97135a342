"""Leaf utilities every layer may use, knowing nothing of models: the user-facing error (`errors`), durable
writes (`atomic`), folder locks (`locks`), zebra's cache folders (`caches`), `--device` / `--dtype`
(`device`), device values read on the host (`host_copy`) and torch distributed checkpoints read without
running their code (`safe_dcp`), and lazy package exports (`lazy`)."""
