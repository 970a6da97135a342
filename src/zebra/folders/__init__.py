"""The folders commands read, without torch: a run's checkpoints folder (`checkpoint_dir`), a model folder
(`model_folder`), and the recent ones near here (`discover`)."""
