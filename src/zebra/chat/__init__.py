"""`zebra chat`: a conversation kept in the model's constant-size recurrent state (session) and the interactive
loop (repl)."""

# The most new tokens one reply of `zebra chat` (--max-new, /max) or one `zebra generate` (--max-new) may ask for:
# past any model's context, and a bound on what the engine's int64 token budget is given.
MAX_NEW_TOKENS = 1_000_000
