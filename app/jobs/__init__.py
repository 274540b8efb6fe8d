"""The job domain: states, creation, claiming and outcomes, free of Flask and torch."""
