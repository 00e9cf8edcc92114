"""What runs inside one launched rank: its entry (`entry`: set-up, train, the one-line error and
the exit), the trainer (`trainer`), and, in fault-tolerant mode, the rounds through torchft's
Manager (`ft_rounds`) and the tensors-only healing transport (`ft_transport`). Nothing here is
imported by the launching process's drivers (engine/drivers/), nor the other way round."""
