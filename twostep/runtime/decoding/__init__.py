"""Decoding, written once for every backend, by job:

    options   what a decode is asked for (DecodeOptions, checked once), the model's special token ids
              (Specials) and what it gives back (Hypothesis)
    kernels   the numeric kernels of a step: log-softmax normalisers, each row's best candidates, beam
              search's selection over whole sentences
    search    the search strategies, each a Group of a batch's sentences: Greedy, Sampling, Beam
    batch     the step session a backend hands the loop (StepSession), the running batch that sentences join
              and leave between steps (RunningBatch, Entry), and `decode` (step by step: `decode_steps`), its
              static case

Nothing here is module-level state: a beam group owns its helper thread, a step session its busy lock.
"""

from twostep.runtime.decoding.batch import Entry, RunningBatch, StepSession, decode, decode_steps, pad_batch
from twostep.runtime.decoding.options import DecodeOptions, Hypothesis, Specials

__all__ = ["DecodeOptions", "Entry", "Hypothesis", "RunningBatch", "Specials", "StepSession", "decode", "decode_steps",
           "pad_batch"]
