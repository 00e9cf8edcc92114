"""Per-rank checkpoints: the on-disk format (`files`), which checkpoint a run resumes from
(`resume`), and the collective save and agreement of all ranks (`collective`)."""
