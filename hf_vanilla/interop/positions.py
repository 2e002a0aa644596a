"""How many positions an export covers. An exported graph or another engine cannot extend the sinusoid table as the
PyTorch model does, so exports carry at least `MIN_EXPORTED_POSITIONS` of them; learned positions stop at their
table."""

from ..configuration_vanilla import VanillaTransformerConfig


MIN_EXPORTED_POSITIONS = 1024


def position_limit(config: VanillaTransformerConfig) -> int:
    if config.position_embedding_type == "sinusoidal":
        return max(config.max_position_embeddings, MIN_EXPORTED_POSITIONS)
    return config.max_position_embeddings
