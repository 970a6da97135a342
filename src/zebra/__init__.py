"""Zebra: train, convert, verify, evaluate and chat with hybrid recurrent-attention language models."""

__version__ = "0.1.0"
