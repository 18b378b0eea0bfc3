"""Grading: tasks, test report parsers, reward policies and the clean-room grader."""
