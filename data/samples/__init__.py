"""The forms a data set's samples take: what the pipelines read and `data.prepare` writes from.

A data set names its form (`DataSet.form`) and hands out its splits in it (`DataSet.samples`):
tensors already in the model's input form, held in memory (`TensorSamples`, digits); uint8 image
arrays in memory (`ArraySamples`, CIFAR); image files in the ImageFolder layout
(`ImageFolderSamples`, ImageNet). The torchvision pipeline reads a form item by item, and
`data.prepare` writes FFCV's `.beton` rows and DALI's one-file-per-sample copies through it, so a
new data set in one of these forms needs no reading or writing code of its own.
"""
