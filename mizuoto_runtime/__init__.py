"""Building blocks engines are made of. Importing this package never imports torch."""
