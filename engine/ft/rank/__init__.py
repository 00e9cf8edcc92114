"""Fault-tolerant mode inside a replica: rounds through torchft's Manager behind the plugins'
`dist_algos.comm.round_averager.RoundAverager`, healing and the per-round record (`rounds`), and
the tensors-only healing transport (`transport`). The trainer imports them inside a function when
the mode is on (torchft is heavy). Never imports engine/ft/launch/, nor the other way round."""
