"""Training: the loop (`trainer`), data parallelism (`parallelize`), checkpoints (`checkpoint`), AdamW and its
schedule (`optim`), megatron data (`data`), metrics (`metrics`), the rank entry point (`entry`) and the local
launcher (`launch`).

    from zebra.train.plan import make_plan, prepare_run
    plan = make_plan("tiny", max_steps=50)
    prepare_run(plan)
    from zebra.train.trainer import train_rank
    result = train_rank(plan.run_dir)                       # one rank, in this process
    from zebra.train.launch import launch_local
    launch_local(plan.run_dir, nproc_per_node=2, device="cpu")   # several ranks through the elastic agent
"""
