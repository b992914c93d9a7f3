"""Parameter-efficient fine-tuning: LoRA adapters on the shared ``Linear`` projection."""
