"""verl's interaction interface (simulated users): ``verl.interactions.base.BaseInteraction``."""
