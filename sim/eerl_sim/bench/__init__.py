"""eerl-bench: the controller measured against the default governor and the offline sweep oracle."""
