"""Quality at speed: the E2E, XSum and CNN/DailyMail studies, their driver (study.sh), scoring and report."""
