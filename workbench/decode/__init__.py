"""The live decoder: acceptance rules, the Medusa and vanilla loops, where two outputs differ and why."""
