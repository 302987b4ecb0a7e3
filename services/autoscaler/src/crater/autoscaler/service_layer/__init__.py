"""Consume -> decide -> publish: what the autoscaler does with each message it takes."""
