"""The demo model and datasets: a synthetic corpus, its tokenizer, and a small pre-trained model."""
