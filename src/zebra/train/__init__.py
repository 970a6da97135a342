"""Training: the run resolved before any rank starts (`run`), the loop of one rank (`trainer`), its step
(`step`), data parallelism (`parallelize`), checkpoints (`checkpoint`), AdamW and its schedule (`optim`),
megatron data (`data`), metrics (`metrics`), what the loop reports (`view`), the rank's place in the job
(`dist`) and which peers it lost when a collective fails (`peers`). Starting ranks is `zebra.launch`'s; the rank program is `python -m zebra.cli.rank`.

    from zebra.recipes import load_recipe
    from zebra.train.run import RankLayout, prepare_run, resolve_run
    from zebra.train.trainer import train_rank
    run = resolve_run(load_recipe("tiny", overrides=["train.max_steps=50"]), RankLayout("cpu", 1, 1))
    prepare_run(run)
    result = train_rank(run.run_dir)                        # one rank, in this process
"""
