"""The model layer: LLaDA2-MoE config, forward, checkpoints, block-diffusion decoding and task prompts."""
