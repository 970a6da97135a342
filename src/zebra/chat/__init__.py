"""`zebra chat`: a conversation kept in the model's constant-size recurrent state (session) and the interactive
loop (repl)."""
