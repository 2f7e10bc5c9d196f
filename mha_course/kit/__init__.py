"""The kit every notebook uses (none of it is attention itself).

setup       mc.setup(): seeds, print precision, PNG figures; environment_report()
plotting    heatmap(...), show(fig): titled, labelled figures
widgets     explorer(draw, controls): a static figure first, then the controls
quiz        show("NN"): the self-check quiz of notebook NN (questions in quizzes/NN.json)
verify      proof_line(...): "equal within a bound" as one printed line
course_map  the notebook map, the notation table and the English–Chinese glossary
"""
