"""The registry's building blocks (``pretrain.registry`` reads them and re-exports the record types).

Its modules:

  records     -- the record types: Implementation, DecoderShape, LatentAttention, Routing, HFFormat, Family, ...
  common      -- what several model types share: the LLaMA-style decoder's shape and config checks.
"""
