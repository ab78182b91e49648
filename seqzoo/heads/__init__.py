"""What sits on an encoder's outputs and final state: poolers; the attentional decoders of seq2seq."""
