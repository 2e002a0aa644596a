"""The lab: speed and memory of hf_vanilla against MarianMT (not shipped in the wheel)."""
