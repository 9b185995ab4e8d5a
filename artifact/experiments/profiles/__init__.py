"""The bundled profiles (*.yaml: cpu, a5000, h200, h200_flash, a5000_ae, h200_ae) and what
artifact.experiments.settings reads them with: checks (reading a profile file and checking every value: types,
ranges, choices) and slurm (the `slurm:` section, a mapping layered key by key)."""
