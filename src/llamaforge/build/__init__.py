"""Build: recipes, the pure build plan, the llama.cpp source and patch series, executing a plan, the build store,
reproducibility, base images, the doctor and CUDA arch handling."""
