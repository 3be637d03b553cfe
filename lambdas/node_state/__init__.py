"""Node-state refresher Lambda."""
