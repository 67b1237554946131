"""`.env` files as their two readers read them: Docker Compose and bash (the README's `set -a; . ./.env`).

- ``reading``: what a reader makes of a file (shared by the two models);
- ``compose``: Compose v5's reading, a port of compose-go's dotenv parser;
- ``bash``: bash's reading, the part of its grammar a .env file uses;
- ``judge``: one warning per line that the two read apart (``env_file_problems``).
"""

from recipe.env_file.judge import env_file_problems

__all__ = ["env_file_problems"]
