"""`zebra chat`: a conversation kept in the model's constant-size recurrent state (session), the interactive loop
(repl) and which local models a user likely means (discover)."""
