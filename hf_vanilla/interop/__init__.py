"""Other implementations and engines: MarianMT / OPUS-MT checkpoints in, CTranslate2 and ONNX out."""
