"""The e2e harness: assets, the recipe's plan with the CPU mapping, the trainer under a timeout."""
