"""The host-to-device link: emulated and CUDA links, their copy timeline and pacing, make_link, the cost
model."""
