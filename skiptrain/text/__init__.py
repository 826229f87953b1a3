"""Task templates, tokenisation and the batch layout: text into tensors, shared by data, training and inference."""
