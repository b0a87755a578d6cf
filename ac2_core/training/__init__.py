"""Training backends. ``torch`` is the default; ``deepspeed`` (ZeRO 0-3) needs the ``ac2[deepspeed]`` extra.

Both have one ``Trainer`` with the same contract: ``step(micro_batches, loss_fn)``,
``steps_taken``, ``current_lr()``, ``save(folder)`` and ``load(folder)``, and the same
checkpoint layout, so a run can switch backends between iterations.
``ModelStore.trainer`` picks one from ``training.backend``. In a group of processes that a
stage launched (``ranks``, ``training.data_parallel``) each trainer takes the one step over
the whole batch with the others, and ``whole_weights()`` gives the model its whole weights
for rank 0 to save.
"""
